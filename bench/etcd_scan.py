"""etcd: full scans of a cluster kept by Pulsar's metadata store on a real etcd, against the floor
measured in the same run.

The cluster of `bench.scale` (30 bookies on 5 racks, 1,000 entries a ledger, an agent process per bookie
on the synthetic store) written on etcd as Pulsar keeps it. For each size:

- metadata reads in one process, in alternating rounds (the medians), nothing decoded: every ledger key
  read by one paged range (pages of 1,000 at one revision); by range reads of 500 ledgers each, 8 in
  flight; by single-key gets in Txn batches of 128 (etcd's op limit), 8 in flight. The floor is the
  fastest of the three. Then the store's own enumeration (bounded windows of buckets, a keys-only range per
  bucket) and reads, decoded, against it, and the decoding alone (from memory: the part that is not I/O);
- the full scan (`ScrutinyRun` on Spark local[2]) against its floor: the raw range reads of every bucket
  as Spark tasks, plus every (bookie, ledger) answer streamed from the agents (as `bench.scale`);
- etcd's requests for the scan (the store's own count, every process) and the server's CPU seconds.

    python -m bench.etcd_scan --sizes 100000,1000000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, start_agents, stop_agents, table
from bench.scale import build, stream_answers
from scrutiny.config import ScanSettings
from scrutiny.metadata import Layout, decode_ledger_metadata, ledger_path
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import SparkEngine, spark_session
from scrutiny.store.etcd import EtcdStore, open_store
from scrutiny.store.etcdkv import EtcdKV
from scrutiny.testing.localetcd import EtcdTree, LocalEtcd

ROOT = "/ledgers"


def paged_range(kv: EtcdKV) -> int:
    """Every key below the root with its value, in pages; only ledger keys counted."""
    return sum(1 for item in kv.scan_prefix(f"{ROOT}/".encode()) if b"/L" in item.key[-6:] and item.value)


def pipelined_ranges(kv: EtcdKV, ids: list[int]) -> int:
    keys = [ledger_path(Layout.HIERARCHICAL, ROOT, lid).encode() for lid in ids]
    spans = [(keys[i], keys[min(i + 500, len(keys)) - 1] + b"\0") for i in range(0, len(keys), 500)]
    return sum(1 for item in kv.ranges(spans) if item.value)


def txn_gets(kv: EtcdKV, ids: list[int]) -> int:
    keys = (ledger_path(Layout.HIERARCHICAL, ROOT, lid).encode() for lid in ids)
    return sum(1 for _, item in kv.get_many(keys) if item is not None)


def decoding(values: list[tuple[int, bytes, int]]) -> int:
    """The part of the store's reads that is not I/O: each ledger's metadata decoded, from memory."""
    return len([decode_ledger_metadata(lid, value, 0, version - 1) for lid, value, version in values])


def store_reads(store: EtcdStore) -> int:
    return sum(1 for rng in store.ledger_ranges() for r in store.read_ledgers(store.ledger_ids(rng))
               if r.metadata is not None)


def _read_bucket(endpoint: str, token: str) -> int:
    kv = EtcdKV([endpoint])
    try:
        return sum(1 for _ in kv.scan_prefix(f"{ROOT}/{token}/".encode()))
    finally:
        kv.close()


def run_size(count: int, entries: int, rounds: int, session: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"ledgers": count}
    with tempfile.TemporaryDirectory() as tmp, LocalEtcd(quota_bytes=8 << 30) as etcd:
        tree = EtcdTree(etcd.endpoint)
        t0 = time.perf_counter()
        held = build(tree, ROOT, count, entries, Path(tmp))
        row["build s"] = time.perf_counter() - t0
        agents = start_agents(held, Path(tmp), etcd.uri)
        try:
            ids = list(range(count))
            ways: dict[str, Callable[[EtcdStore], int]] = {
                "paged range": lambda st: paged_range(st.kv),
                "ranges of 500, 8 in flight": lambda st: pipelined_ranges(st.kv, ids),
                "Txn gets, 8 in flight": lambda st: txn_gets(st.kv, ids),
                "store": store_reads,
                "decoding alone": lambda st: decoding(values)}
            times: dict[str, list[float]] = {what: [] for what in ways}
            with open_store(ScanSettings(metadata_service_uri=etcd.uri)) as store:
                values = [(int(item.key[-4:]) + int(item.key[len(ROOT) + 1:-6].replace(b"/", b"")) * 10_000,
                           item.value, item.version) for item in store.kv.scan_prefix(f"{ROOT}/".encode())
                          if b"/L" in item.key[-6:]]
                for _ in range(rounds):
                    for what, fn in ways.items():
                        t0 = time.perf_counter()
                        assert fn(store) == count, what
                        times[what].append(time.perf_counter() - t0)
                ranges = [r.token for r in store.ledger_ranges()]
                addresses = store.agent_addresses()
            medians = {what: statistics.median(t) for what, t in times.items()}
            floor = min(v for what, v in medians.items() if what not in ("store", "decoding alone"))
            row["metadata floor s"] = floor
            for what, v in medians.items():
                row[f"{what} / floor"] = v / floor
            # -- the full scan on Spark against its floor, the fastest of two
            sc = session.sparkContext
            endpoint = etcd.endpoint
            work = [(addresses[b], v[i:i + 20_000]) for b, v in held.items() for i in range(0, len(v), 20_000)]
            floors = []
            for _ in range(2):
                t0 = time.perf_counter()
                assert sc.parallelize(ranges, len(ranges)).map(lambda t: _read_bucket(endpoint, t)).sum() == count
                assert sc.parallelize(work, len(work)).map(lambda w: stream_answers(*w)).sum() == \
                    sum(len(v) for v in held.values())
                floors.append(time.perf_counter() - t0)
            row["scan floor s"] = min(floors)
            settings = ScanSettings(metadata_service_uri=etcd.uri, recheck_delay=1.0, spark_master="local[2]")
            etcd_cpu = cpu_seconds(etcd.pid)
            t0 = time.perf_counter()
            report = ScrutinyRun(settings, SparkEngine(session=session)).execute()
            scan = time.perf_counter() - t0
            assert report.complete and not report.violations, (report.errors[:3], report.counts)
            assert report.ledgers["checked"] == count
            row["scan s"] = scan
            row["scan / floor"] = scan / row["scan floor s"]
            row["ledgers/s"] = count / scan
            row["etcd requests / ledger"] = report.stats.get("store_reads", 0) / count
            row["etcd CPU s"] = cpu_seconds(etcd.pid) - etcd_cpu
        finally:
            stop_agents(agents)
            tree.close()
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--entries", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    session = spark_session("local[2]")  # before any gRPC thread exists: the JVM's fork fails after
    rows = []
    try:
        for size in (int(s) for s in a.sizes.split(",")):
            rows.append(run_size(size, a.entries, a.rounds, session))
            print(table(rows), flush=True)
            print(flush=True)
    finally:
        session.stop()


if __name__ == "__main__":
    main()
