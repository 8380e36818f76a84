"""Pulsar's record against BookKeeper's: what it adds to a full run, measured against the same run without it.

A cluster of `--topics` topics, each with `--ledgers-per-topic` closed ledgers tagged as Pulsar tags them and
two cursors with their positions inline (the managed-ledger and cursor records encoded as Pulsar encodes them,
half of them LZ4-compressed), 30 bookie agents on synthetic stores, one ZooKeeper. The full run with the
topics phase (`pulsar_check`) and without it, alternately (`--rounds` each, on one engine, Spark on `local[2]`): the
medians of their seconds and of the ZooKeeper requests each made (the server's own packet counter), and the
ratios. Every run must be complete and find nothing.

    python -m bench.topics --topics 10000
    python -m bench.topics --topics 100000 --rounds 2      # 1M ledgers
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from bench import scale
from bench.common import start_agents, stop_agents, table
from bench.harness import BenchCluster
from scrutiny.config import ScanSettings
from scrutiny.pulsar import encode
from scrutiny.pulsar.records import LedgerInfo, Position, managed_ledger_of
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import Engine, SparkEngine, spark_session
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.localzk import packets_received

ENTRIES = 100


def topic_name(t: int) -> str:
    return f"persistent://public/bench/topic-{t}"


def build(client: KazooClient, root: str, topics: int, per_topic: int, store_dir: Path) -> dict[str, list[int]]:
    """The ledgers (topic t owns ledgers t * per_topic ..), the bookies' stores, the topics' records."""
    held = scale.build(client, root, topics * per_topic, ENTRIES, store_dir, lambda md: dataclasses.replace(
        md, custom_metadata=encode.ledger_keys("topic", topic_name(md.ledger_id // per_topic))))
    w = ClusterWriter(client, root)

    def records() -> Iterator[tuple[str, bytes]]:
        for t in range(topics):
            listed = [LedgerInfo(lid, ENTRIES, ENTRIES * 1024) for lid in range(t * per_topic, (t + 1) * per_topic)]
            yield (w.managed_ledger_path(managed_ledger_of(topic_name(t))),
                   encode.managed_ledger(listed, "LZ4" if t % 2 else "NONE"))

    def cursors() -> Iterator[tuple[str, bytes]]:
        for t in range(topics):
            base = w.managed_ledger_path(managed_ledger_of(topic_name(t)))
            for n, sub in enumerate(("sub-a", "sub-b")):
                yield f"{base}/{sub}", encode.cursor(-1, Position(t * per_topic + n, ENTRIES // 2))

    w.write_nodes(records(), batch=1000, parents=True)
    w.write_nodes(cursors(), batch=1000)
    return held


def run(topics: int, per_topic: int, rounds: int, engine: Engine | None = None) -> dict[str, Any]:
    """`engine`: Spark on local[2] (the process's session, left running for the caller) unless given."""
    count = topics * per_topic
    row: dict[str, Any] = {"topics": topics, "ledgers": count}
    heap = "3g" if count > 300_000 else "1g"
    with tempfile.TemporaryDirectory() as tmp, BenchCluster(heap, root="/ledgers") as cluster:
        zk, client, root, uri = cluster.zk, cluster.client, cluster.root, cluster.uri
        t0 = time.perf_counter()
        held = build(client, root, topics, per_topic, Path(tmp))
        row["build s"] = time.perf_counter() - t0
        agents = start_agents(held, Path(tmp), uri)
        engine = engine or SparkEngine(session=spark_session("local[2]"))
        try:
            seconds: dict[bool, list[float]] = {True: [], False: []}
            requests: dict[bool, list[int]] = {True: [], False: []}
            phase: list[float] = []
            for _ in range(rounds):
                for pulsar in (True, False):  # alternately: the machine's noise falls on both
                    settings = ScanSettings(metadata_service_uri=uri, recheck_delay=1.0, pulsar_check=pulsar)
                    received = packets_received(zk.port)
                    t0 = time.perf_counter()
                    report = ScrutinyRun(settings, engine).execute()
                    seconds[pulsar].append(time.perf_counter() - t0)
                    requests[pulsar].append(packets_received(zk.port) - received)
                    assert report.complete and not report.violations, (report.errors[:3], report.counts)
                    assert report.ledgers["checked"] == count
                    if pulsar:
                        assert report.stats["pulsar_topics"] == topics, report.stats
                        phase.append(report.stats["pulsar_ms"] / 1000)
            on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
            req_on, req_off = statistics.median(requests[True]), statistics.median(requests[False])
            row |= {"runs each": rounds, "full run s (off)": off, "full run s (on)": on, "time on / off": on / off,
                    "topics phase s": statistics.median(phase), "zk requests (off)": req_off,
                    "zk requests (on)": req_on, "requests on / off": req_on / req_off}
        finally:
            stop_agents(agents)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topics", type=int, default=10_000)
    p.add_argument("--ledgers-per-topic", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3, help="full runs with and without the topics phase, each")
    a = p.parse_args()
    session = spark_session("local[2]")
    try:
        print(table([run(a.topics, a.ledgers_per_topic, a.rounds, SparkEngine(session=session))]), flush=True)
    finally:
        session.stop()


if __name__ == "__main__":
    main()
