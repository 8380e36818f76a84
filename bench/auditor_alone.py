"""The auditor alone: `scrutiny auditor` as its own process (the real command, a config file) doing
full runs at a one-second cadence against a cluster churning in this process; after every run, the
auditor's RSS, Python heap (allocated blocks, from its /metrics), descriptors and threads, and its Spark
JVM and Python workers. Writes the figures as JSON and a plot as PNG.

    python -m bench.auditor_alone --runs 1000 --engine local --out bench/results
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from kazoo.client import KazooClient

from bench.common import table
from scrutiny.testing import processes
from scrutiny.testing.auditorsoak import churning, populated, spark_children_mb
from scrutiny.testing.churn import ChurnCluster
from scrutiny.testing.localzk import LocalZooKeeper, free_port

BOOKIES = [f"127.0.6.{n}:3181" for n in range(1, 6)]


@dataclass
class Sample:
    run: int
    seconds: float
    rss_mb: float
    heap_kblocks: float
    fds: int
    threads: int
    jvm_rss_mb: float
    workers_rss_mb: float


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def value(text: str, pattern: str) -> float:
    m = re.search(rf"^{pattern} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def usage(proc: psutil.Process, run: int, t0: float, metrics: str) -> Sample:
    return Sample(run, round(time.monotonic() - t0, 1), proc.memory_info().rss / 2**20,
                  value(metrics, "scrutiny_python_allocated_blocks") / 1000, proc.num_fds(), proc.num_threads(),
                  *spark_children_mb(proc))


def config(uri: str, engine: str, port: int, metrics_port: int, reports: str) -> str:
    spark = "spark_conf:\n  spark.driver.memory: 512m\n" if engine == "spark" else ""
    return (f"metadata_service_uri: {uri}\nengine: {engine}\nspark_master: local[2]\n{spark}"
            "placement_policy: none\nrecheck_delay: 0.3\nunderreplicated_grace_period: 1\n"
            "bookie_deadline_seconds: 2.0\nzk_session_timeout: 10\n"
            f"auditor:\n  listen: 127.0.0.1:{port}\n  reports_dir: {reports}\n  reports_keep: 5\n"
            "  full_interval_seconds: 1\n  underreplication_interval_seconds: 0\n  insecure_open_rescan: true\n"
            f"metrics:\n  listen: 127.0.0.1:{metrics_port}\n")


def soak(runs: int, engine: str, seed: int) -> tuple[list[Sample], float]:
    """Samples after every full run, and the findings reported (false alarms: the churn is lawful)."""
    with LocalZooKeeper() as zk, tempfile.TemporaryDirectory() as tmp:
        client = KazooClient(hosts=zk.hosts, timeout=15)
        client.start(timeout=15)
        try:
            return soak_on(client, zk.hosts, Path(tmp), runs, engine, seed)
        finally:
            client.stop()
            client.close()


def soak_on(client: KazooClient, hosts: str, tmp: Path, runs: int, engine: str, seed: int
            ) -> tuple[list[Sample], float]:
    uri = f"zk+hierarchical://{hosts}/ledgers"
    cluster = populated(ChurnCluster(client, "/ledgers", uri, BOOKIES, 0.3, random.Random(seed)))
    port, metrics_port = free_port(), free_port()
    cfg = tmp / "scrutiny.yaml"
    cfg.write_text(config(uri, engine, port, metrics_port, str(tmp / "reports")))
    with churning(cluster), (tmp / "auditor.log").open("w") as log:
        auditor = processes.spawn([sys.executable, "-m", "scrutiny.cli", "auditor", "--config", str(cfg)],
                                   stdout=subprocess.DEVNULL, stderr=log)
        try:
            return watch(auditor, metrics_port, runs, engine)
        finally:
            auditor.terminate()
            auditor.wait(60)


def watch(auditor: subprocess.Popen[bytes], metrics_port: int, runs: int, engine: str) -> tuple[list[Sample], float]:
    proc = psutil.Process(auditor.pid)
    samples: list[Sample] = []
    reported = 0.0
    t0, seen = time.monotonic(), 0.0
    deadline = t0 + runs * 30
    while len(samples) < runs and time.monotonic() < deadline and auditor.poll() is None:
        time.sleep(0.1)
        try:
            text = scrape(metrics_port)
        except OSError:
            continue
        done = value(text, r'scrutiny_runs_total\{kind="full",outcome="complete"\}')
        if done > seen:
            seen = done
            reported = sum(float(v) for v in re.findall(r"^scrutiny_violations_reported_total\{[^}]*\} (\S+)$",
                                                          text, re.M))
            samples.append(usage(proc, int(done), t0, text))
            if len(samples) % 100 == 0:
                print(f"{engine}: {len(samples)} runs, RSS {samples[-1].rss_mb:.0f} MB", file=sys.stderr)
    return samples, reported


def growth(samples: list[Sample], field: str, warmup: int) -> tuple[float, float]:
    """Median of the field over the first tenth after warm-up and over the last tenth."""
    body = samples[warmup:]
    tenth = max(1, len(body) // 10)
    first = statistics.median(getattr(s, field) for s in body[:tenth])
    last = statistics.median(getattr(s, field) for s in body[-tenth:])
    return first, last


def plot(results: dict[str, list[Sample]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fields = [("rss_mb", "auditor RSS (MB)"), ("heap_kblocks", "Python heap (k blocks)"), ("fds", "open fds"),
              ("threads", "threads"), ("jvm_rss_mb", "Spark JVM RSS (MB)"), ("workers_rss_mb", "Python workers (MB)")]
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for ax, (field, title) in zip(axes.flat, fields, strict=True):
        for engine, samples in results.items():
            ax.plot([s.run for s in samples], [getattr(s, field) for s in samples], label=engine, linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel("full runs")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.suptitle("scrutiny auditor alone: resources after every full run, cluster churning")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--engine", action="append", choices=["local", "spark"])
    p.add_argument("--warmup", type=int, default=50, help="runs left out of the growth figures")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--merge", nargs="*", default=[], metavar="JSON",
                   help="figures an earlier invocation wrote (one engine each, run in parallel): plot them together")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[Sample]] = {}
    rows = []
    earlier = {}  # engine -> (samples, findings) from an earlier invocation (engines run in parallel)
    for path in args.merge:
        for engine, got in json.loads(Path(path).read_text()).items():
            earlier[engine] = ([Sample(**s) for s in got["samples"]], got["findings"])
    for engine in args.engine or ([] if earlier else ["local", "spark"]):
        earlier[engine] = soak(args.runs, engine, args.seed)
    for engine, (samples, reported) in earlier.items():
        results[engine] = samples
        for field in ("rss_mb", "heap_kblocks", "fds", "threads", "jvm_rss_mb", "workers_rss_mb"):
            first, last = growth(samples, field, args.warmup)
            rows.append({"engine": engine, "runs": len(samples), "figure": field, "after warm-up": first,
                         "at the end": last, "per 100 runs": (last - first) / max(1, len(samples) - args.warmup)
                         * 100, "findings (false alarms)": int(reported)})
    one = args.engine and len(args.engine) == 1 and not args.merge
    name = f"auditor_alone_{args.engine[0]}" if one else "auditor_alone"
    (out / f"{name}.json").write_text(json.dumps({e: {"samples": [asdict(s) for s in ss], "findings": f}
                                                  for e, (ss, f) in earlier.items()}))
    plot(results, out / f"{name}.png")
    print(table(rows))


if __name__ == "__main__":
    main()
