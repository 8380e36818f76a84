"""Auditor soak: a leading auditor doing full runs back to back while the cluster churns; its memory,
open file descriptors and threads, and the Spark executors' memory, sampled after every run.

    python -m bench.auditor_soak --runs 200 --engine spark
"""

from __future__ import annotations

import argparse
import tempfile

from kazoo.client import KazooClient

from bench.common import table
from scrutiny.scan.engines import Engine, LocalEngine, SparkEngine
from scrutiny.testing.auditorsoak import auditor_soak
from scrutiny.testing.localzk import LocalZooKeeper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--engine", choices=["local", "spark"], default="spark")
    args = p.parse_args()
    engine: Engine = LocalEngine() if args.engine == "local" else SparkEngine("local[2]")
    with LocalZooKeeper() as zk, tempfile.TemporaryDirectory() as reports:
        client = KazooClient(hosts=zk.hosts, timeout=15)
        client.start(timeout=15)
        try:
            samples = auditor_soak(client, "/ledgers", zk.hosts, args.runs, engine, reports)
        finally:
            client.stop()
            client.close()
            engine.close()
    picks = sorted({0, len(samples) // 10, len(samples) // 2, len(samples) - 1})
    print(table([{"run": s.run, "auditor RSS MB": round(s.rss_mb), "open fds": s.fds, "threads": s.threads,
                  "Spark JVM RSS MB": round(s.jvm_rss_mb), "Python workers RSS MB": round(s.workers_rss_mb)}
                 for s in (samples[i] for i in picks)]))


if __name__ == "__main__":
    main()
